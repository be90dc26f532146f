"""Analytic cost-profile builder (``dsparksim profile build``): arch x hardware x parallelism -> profile."""
