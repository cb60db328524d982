"""What every lab test does with a planted wrong answer: expect the checker to reject it, for the right reason.

    rejected = expect_rejection(check_ddp, broadcast, average, world_sizes=(2,), mistake="not_divided",
                                phrase="divide by")

The checker must raise ``LabCheckFailed`` whose ``.mistake`` is ``mistake`` (the classic mistake it
recognised) and whose message contains ``phrase`` (typically words of the hint, so the learner is told
what to fix). Returns the exception, for tests that look further.
"""

import pytest

from utils.checkers.common import LabCheckFailed


def expect_rejection(check, *args, mistake, phrase=None, **kwargs):
    __tracebackhide__ = True
    with pytest.raises(LabCheckFailed) as failure:
        check(*args, **kwargs)
    assert failure.value.mistake == mistake, f"expected the mistake {mistake!r}, got: {failure.value}"
    if phrase is not None:
        assert phrase in str(failure.value), f"expected {phrase!r} in: {failure.value}"
    return failure.value
