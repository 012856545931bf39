"""This library's version in NeMo-RL v0.7.0's form (``nemo_rl.package_info``): ``VERSION`` is
``(MAJOR, MINOR, PATCH, PRE_RELEASE)``. The numbers are this library's own (pyproject.toml's ``version``, read from
the installed package's metadata), not NeMo-RL's: code comparing them with NeMo-RL's releases is comparing different
projects."""

import re
from importlib.metadata import version as _installed_version

__version__ = _installed_version("nemo_rl_clone")
_parts = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(.*)", __version__)
if _parts is None:
    raise RuntimeError(f"nemo_rl_clone's version {__version__!r} is not MAJOR.MINOR.PATCH[pre-release]")
MAJOR, MINOR, PATCH = (int(number) for number in _parts.groups()[:3])
PRE_RELEASE = _parts.group(4)
VERSION = (MAJOR, MINOR, PATCH, PRE_RELEASE)
__shortversion__ = f"{MAJOR}.{MINOR}.{PATCH}"
__package_name__ = "nemo_rl_clone"
