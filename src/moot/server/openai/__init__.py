"""The OpenAI door: ``/v1/chat/completions`` (:mod:`.chat`), ``/v1/responses`` (:mod:`.responses`,
with its stored state and its background, streamed and compacted modes). Each wire shape is read once
into what it asks (:class:`~.asked.Asked`: :mod:`.fields` for chat completions, :mod:`.responses_request`
for the Responses API), whose schemas go to its debate's engine as values (:mod:`.submission`); a live
debate is an OpenAI-shaped stream read from typed events (:mod:`.debate_feed`). Below them: the models
offered (:mod:`.catalogue`), refusals by name (:mod:`.refusals`), a request's messages
(:mod:`.conversation`), a typed reply's schema (:mod:`.reply_format`), the chat completions API's wire
shapes (:mod:`.chat_wire`), the Responses API's wire objects
(:mod:`.response_objects`) and events (:mod:`.responses_stream`), what the Open Responses standard asks
(:mod:`.open_responses`) and the files a request sends inline (:mod:`.input_files`).

Not the ``openai`` SDK: an absolute ``import openai`` anywhere (here too) is the SDK.
"""
