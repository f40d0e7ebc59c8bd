"""Which parametrized cases of a module README's command leaves to
`-m matrix` (docs/TESTING.md).

conftest.py asks each test module's `in_matrix(item)`; a module whose cases
are parametrized by a fixture (so `pytest.param(marks=...)` cannot mark
them) builds that rule here.
"""


def matrix_rule(fixture, in_ci):
    """An `in_matrix(item)` rule: a case of a test named in `in_ci`, whose
    `fixture` parameter is not among that test's CI-tier values, is in the
    matrix.

    Args:
        fixture: string. The parametrized fixture's name.
        in_ci: dict of test function name to the fixture values that stay
            in the CI tier.

    Example:

    ```python
    in_matrix = tiers.matrix_rule("served", {"test_sampler": ("llama",)})
    ```
    """

    def in_matrix(item):
        callspec = getattr(item, "callspec", None)
        if callspec is None or fixture not in callspec.params:
            return False
        values = in_ci.get(item.originalname)
        return values is not None and callspec.params[fixture] not in values

    return in_matrix
