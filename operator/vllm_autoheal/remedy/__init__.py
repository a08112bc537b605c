"""Heal planning: plan_heal(spec, diagnosis, history, inventory) -> Remedy, the one flag change that
should fit. The Remedy and what it is planned from are in model.py, the steps in steps.py, the
planner and its PLANS table in plan.py, what a give-up says would fit in advice.py."""

from .advice import what_would_fit
from .model import GIVE_UP, NO_CHANGE, Context, Inventory, Remedy
from .plan import PLANS, plan_from_command, plan_heal

__all__ = [
    "GIVE_UP",
    "NO_CHANGE",
    "Context",
    "Inventory",
    "Remedy",
    "PLANS",
    "plan_from_command",
    "plan_heal",
    "what_would_fit",
]
