"""The recording proxy: attribution, token capture, relay to the upstream, the /art/v1 API."""
