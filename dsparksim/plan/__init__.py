"""Capacity planning: the cheapest deployment meeting an SLO at a given traffic, per verification-policy family.

``load_plan(path)`` -> :class:`PlanSpec` (validated, nothing run); ``run_plan(spec, out)`` -> :class:`PlanRun`
(bisection on replicas with pruning, cached sweep cells); ``write_plan(run, out)`` writes the result set.
"""
from dsparksim.plan.cost import cost_per_hour, cost_per_mtok
from dsparksim.plan.report import summarize_plan, text_report, write_plan
from dsparksim.plan.search import PlanRun, brute_force, run_plan
from dsparksim.plan.spec import Deployment, PlanSpec, load_plan, plan_from_dict

__all__ = ["Deployment", "PlanRun", "PlanSpec", "brute_force", "cost_per_hour", "cost_per_mtok", "load_plan",
           "plan_from_dict", "run_plan", "summarize_plan", "text_report", "write_plan"]
