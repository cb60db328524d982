"""One test file per lab checker, named like the checker in utils/checkers/: the planted wrong answers of each lab.

What every lab shares (the table covers every lab notebook, the reference passes, the notebook's stubs
raise their own error) is tested once, for all labs, in tests/test_every_lab.py.
"""
