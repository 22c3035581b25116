"""The OpenAI door: ``/v1/chat/completions`` (:mod:`.chat`), ``/v1/responses`` (:mod:`.responses`,
with its stored state and its background, streamed and compacted modes), what each OpenAI request
field does (:mod:`.fields`), a live debate as an OpenAI-shaped stream (:mod:`.debate_feed`), what
the Open Responses standard asks (:mod:`.open_responses`) and the files a request sends inline
(:mod:`.input_files`).

Not the ``openai`` SDK: an absolute ``import openai`` anywhere (here too) is the SDK.
"""
