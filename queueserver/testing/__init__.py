"""Tooling for the tests, the benchmarks and the load tests; the server
never imports it.

It ships in the package, not in ``tests/``, because ``tests/`` and
``loadtests/`` both start real servers, and they import the package
(installed, or the checkout) rather than each other: one careful way to
start and stop a server (:mod:`.serverprocess`) serves them all.
"""
