"""The spool's wire format: the documents the hook writes and every reader reads (``schema``),
where they live in the spool (``spool``) and the profile requests readers write (``requests``).
The lowest layer: it imports nothing else from oomsight."""
