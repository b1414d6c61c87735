Feature: Anthropic Messages API
  /v1/messages beside /execute and the OpenAI routes, onto the same validation, queue and
  engine, answered in Anthropic's shapes: one message, or its named SSE events (issue 43).

  @EXT-043.1 @any
  Scenario: A message is answered whole and as Anthropic's stream of events, with its usage and stop reason
    Given a worker on the reference model
    When I post this to /v1/messages whole and streamed:
      """
      {"system": "You are brief.", "messages": [{"role": "user", "content": "Name three colours."}],
       "max_tokens": 12, "temperature": 0}
      """
    Then the stream is Anthropic's event sequence with the whole answer's text
    And the message stopped with "max_tokens" after 12 output tokens

  @EXT-043.2 @any
  Scenario: What /v1/messages cannot honour is refused in Anthropic's error shape, naming it
    Given a worker on the reference model
    Then /v1/messages answers 400 "invalid_request_error" naming "thinking" for:
      """
      {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
       "thinking": {"type": "enabled", "budget_tokens": 1024}}
      """
    And /v1/messages answers 400 "invalid_request_error" naming "max_tokens" for:
      """
      {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}
      """
    And /v1/messages answers 404 "not_found_error" naming "model" for:
      """
      {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
      """
    And /openapi.json documents "/v1/messages"
