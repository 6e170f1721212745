"""Stand-ins for the platforms: local servers that speak their real wire protocols on loopback.

`twitch` (EventSub WebSocket, Helix, OAuth), `twitch_events` (the event
bodies it sends), `jetstream` (Bluesky Jetstream v1) and `streamelements`
(the Astro gateway). They serve the tests, the benchmarks and
`lumio-ingestd demo`; `twitch`, `jetstream` and `streamelements` need
the `websockets` package (the `demo` and `test` extras), which is why this
package imports none of them on its own.
"""
