"""The consume engine every process runs on: lanes, watermark commits, state stores,
tails, replay, outages, faults and the Kafka clients."""
