"""``moot view``: a read-only viewer over one run or transcript: :mod:`.data` reads it once into
typed rows (through the eval store's load layer), :mod:`.api` serves them and the viewer's pages
with the HTTP door's security headers. The pages' files are ``moot/server/static``, which the live
viewer of ``moot serve`` shares.
"""
