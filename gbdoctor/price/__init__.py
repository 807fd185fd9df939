"""``price``: what each distinct graph break costs a training step, measured (docs/price.md).

``driver`` (``price_scan``: the scan, the plan, the modes as set up and with each kind fixed,
trained in alternating rounds with ``run``'s loop, the per-break split); ``check`` (``run
--price``: the prices' prediction beside what ``run`` measured). Records are in
``records.price``.
"""
