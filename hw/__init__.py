"""elmoe3d.hw."""

from .unit_pe import UnitPE, SliceCombiner          # noqa: F401
from .tile import TensorTile                        # noqa: F401
