"""The torch releases the course runs on, said in one place.

``make setup SYSTEM_TORCH=1`` keeps a machine's own torch only if it is one of these (the Makefile reads
this file with ``runpy``, before anything is installed, so it imports nothing, not even torch);
``make preflight`` (``utils/workshop/preflight.py``) fails a box whose torch is not. ``pyproject.toml``
pins one of them exactly (what ``make setup`` installs), and ``make test-torch TORCH=X``
(``utils/course/torch_suite.py``) runs the whole suite on another, in an environment of its own.

A new torch joins the range once ``make test-torch`` has run the suite on it (README, "Another torch").
"""

OLDEST = (2, 11)  # (major, minor): every patch release of these minor versions
NEWEST = (2, 15)
SUPPORTED = f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}"  # in words, for messages
# the releases the whole suite has been run on here (make test, make test-torch): a claim pointer's ``versions``
# (utils/course/claims.py) must cover at least one of them, or nothing would ever check it
SUITE_RELEASES = ("2.13.0", "2.14.1", "2.15.0")


def major_minor(version: str) -> tuple[int, int]:
    """``"2.14.1+cu130"`` -> ``(2, 14)``; a local tag (``+cpu``) or a pre-release suffix does not matter."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def is_supported(version: str) -> bool:
    """Whether torch ``version`` (a string, as ``torch.__version__`` or pip says it) is one the course runs on."""
    return OLDEST <= major_minor(version) <= NEWEST


__all__ = ["OLDEST", "NEWEST", "SUPPORTED", "SUITE_RELEASES", "major_minor", "is_supported"]
