"""``timeline``: train N steps in one mode and explain the step-time pattern.

``train`` (the library API, ``run_timeline``: fresh ranks per run, every step recorded) ->
``assemble`` (the ranks' raw steps as a :class:`~gbdoctor.records.timeline.TimelineReport`,
a run compared with its fixes) -> ``pattern`` (warm-up, periods, causes, fixes). It trains with
``run``'s building blocks; its renderers are in ``report.timeline``.
"""
