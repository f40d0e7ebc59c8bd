"""What the test modules share: tiny trained models, serving checks, a
server runner and the hostile-artifact corpus.

Imported as `from helpers import ...` (pytest puts `tests/` on `sys.path`,
the directory of the root `conftest.py`); `conftest.py` keeps only fixtures.
"""
