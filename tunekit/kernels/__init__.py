"""Kernels beyond MetaSchedule's schedules: a task's candidates of another kind (issue 53)."""
