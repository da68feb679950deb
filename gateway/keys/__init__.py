"""Keys issued at run time: created, scoped, rotated and revoked through the admin API
(``gateway.keys.api``) and the CLI, kept as digests in a store (memory, or Redis shared
by every replica), and looked up per request in this process's copy (``registry``)."""
