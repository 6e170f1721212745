"""Stand-ins for the platforms: local servers that speak their real wire protocols on loopback.

`twitch` (EventSub WebSocket, Helix, OAuth), `twitch_events` (the event
bodies it sends), `kick` (Pusher, webhooks, the public API), `seventv`
(EventAPI and REST), `jetstream` (Bluesky Jetstream v1) and
`streamelements` (the Astro gateway); `base` is the servers' lifecycle they
share (ports, threads, waiting, closing). They serve the tests, the
benchmarks and `lumio-ingestd demo`; all but `twitch_events` need the
`websockets` package (the `demo` and `test` extras), which is why this
package imports none of them on its own.
"""
