"""One proxied request's I/O and timers: the relay and the layers it is built of.

Everything that touches the network or the loop's clock for one request lives
here: admission, the attempts against an upstream, relaying the answer, the
deadlines. The decisions they act on are ``gateway.policy``'s; the verdict on a
stream is ``gateway.guard``'s.
"""
