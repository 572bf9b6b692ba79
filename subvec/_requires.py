"""What subvec needs installed, checked by ``import subvec`` before anything else is imported,
and what an optional extra's module says when its package is missing.

With gymnasium 0.29, the first import of gymnasium 1.x's API fails on a missing name
(``cannot import name 'is_space_dtype_shape_equiv'``), which says nothing about the cause.
"""

from __future__ import annotations

import re

import gymnasium

_major = re.match(r"(\d+)\.", getattr(gymnasium, "__version__", ""))
if _major is not None and int(_major.group(1)) < 1:
    raise ImportError(
        f"subvec needs gymnasium >= 1.0, and gymnasium {gymnasium.__version__} is installed: "
        f'pip install "gymnasium>=1.0". For a script written for gymnasium 0.29, '
        f'SubprocVectorEnv(..., info_format="legacy") keeps the infos layout of 0.29 '
        f"(final_observation/final_info, as CleanRL's scripts read them)"
    )


def missing_extra(exc: ModuleNotFoundError, extra: str) -> ModuleNotFoundError:
    """The error to raise from ``exc``, the failed import of an optional extra's package: the
    same type and module name, saying what to install.

    Args:
        exc: the ``ModuleNotFoundError`` of the import.
        extra: the extra of subvec that installs the package (``"ray"``).

    Returns:
        The error to raise (``raise missing_extra(exc, "ray") from exc``).
    """
    return ModuleNotFoundError(
        f'{exc}: this part of subvec needs the {extra!r} extra: pip install "subvec[{extra}]"',
        name=exc.name,
    )
