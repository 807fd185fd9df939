"""What several frameworks share: the planner's reading of scan reports (``plan``) and the
plan-applying Python code every emitter writes (``emit``)."""
