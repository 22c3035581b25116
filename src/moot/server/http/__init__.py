"""The HTTP door of ``moot serve``: the routers (:mod:`.routes`: the debates API, the catalogue, the
chat endpoint, the viewer's pages), the event streams (:mod:`.streams`), the connection deadline
and cap and ``moot serve``'s uvicorn server (:mod:`.connections`) and
:func:`~moot.server.http.app.create_app` (:mod:`.app`: the lifespan), which stacks the middleware
(:mod:`.middleware`; a body's JSON checked by :mod:`moot.server.bodies`), installs the error handlers
(:mod:`.errors`) and the OpenAPI schema (:mod:`.openapi`), keeps
secrets out of the log (:mod:`.redaction`) and mounts the OpenAI door (:mod:`moot.server.openai`)
and the MCP door.

Not the standard library's ``http``: an absolute ``import http`` (here too) is the standard library.
"""
