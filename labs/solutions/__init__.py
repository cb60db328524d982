"""Reference solutions of the labs, one module per lab.

A lab notebook imports one of these only when run with ``USE_REFERENCE = True`` (the test suite
does, to check that the lab and its checker accept a correct answer). Try the lab yourself first:
reading these before you have written your own answer spoils the exercise.
"""
