"""What an optional extra's module says when its package is missing. (Which gymnasium subvec
needs is ``subvec._compat``'s, checked by ``import subvec`` before anything else.)"""

from __future__ import annotations


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
