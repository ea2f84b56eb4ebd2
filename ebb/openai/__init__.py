"""The OpenAI HTTP API as data: request schemas, chat templates, the translation of a
request into queue messages and of engine events back into OpenAI's response objects
(chat, completions, the Responses API, tool calls), and the tokenizers that render a
conversation into prompt ids. No HTTP, no Redis, no frontdoor: the frontdoor
serves these over HTTP and the webhooks' job collector answers jobs in them.
"""
