"""The processing element (PE) as a composition of small parts (paper Sections 4.1 and 5.2,
Fig. 6 centre, Fig. 10b): :class:`PE` (:mod:`.pe`) instantiates and connects them.

The contract is ``docs/pe.md``; the ISA is :mod:`elmoe3d.isa` (Amaranth layouts in
:mod:`elmoe3d.hw.isa`); the numerics are ``docs/numerics.md``. The functional reference is
:mod:`elmoe3d.sw.golden.pe`: the RTL and it run the same programs in the same tests and are
compared with plain equality.
"""

from .pe import PE


__all__ = ["PE"]
