"""7TV: the EventAPI v3 wire protocol and emote-set mapping (`protocol`, pure) and the
last known state of every followed emote set (`store`, SQL). The source is
`lumio_ingestd.sources.seventv`. Nothing durable in this module itself."""
