"""What several frameworks share: the base every framework plug-in inherits (``base``), the spec
sections every framework's specs are written in (``schema``: torchtitan v0.2.2's JobConfig plus
``[gbdoctor]``; ``sections``: reading and checking them; ``specfile``: the loader's context and
messages), the planner's reading of scan reports (``plan``) and the plan-applying Python code
every emitter writes (``emit``)."""
