"""The pure scheduling core: ``Cell.apply(event) -> [events]``; no IO, no clock."""

from .cell import AGENT_COMMANDS, Cell
from .config import DEFAULT_TIERS, CellConfig, TenantConfig, TierConfig

__all__ = ["AGENT_COMMANDS", "Cell", "CellConfig", "DEFAULT_TIERS", "TenantConfig", "TierConfig"]
