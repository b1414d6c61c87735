Feature: OpenAI-compatible API
  /v1/chat/completions, /v1/completions and /v1/models beside /execute, onto the same
  validation, queue and engine, driven by the async-openai client; the OpenAPI
  document of both front doors (issue 16).

  @EXT-016.1 @any
  Scenario: The async-openai client gets the same chat answer whole and streamed, with usage and logprobs
    Given a worker on the reference model
    When the async-openai client runs this chat completion whole and streamed:
      """
      {"messages": [{"role": "system", "content": "You are brief."},
                    {"role": "user", "content": "Name three colours."}],
       "max_completion_tokens": 12, "temperature": 0.8, "seed": 42, "logprobs": true, "top_logprobs": 3}
      """
    Then both answers are the same 12 tokens, finished with "length"
    And every token has a log-probability

  @EXT-016.2 @any
  Scenario: Text completions honour stop strings, whole and streamed
    Given a worker on the reference model
    When the async-openai client runs this text completion whole and streamed:
      """
      {"prompt": "1, 2, 3, 4,", "max_tokens": 24, "temperature": 0, "stop": [" 7"], "logprobs": 2}
      """
    Then both answers are the same 8 tokens, finished with "stop"
    And the text does not contain " 7"
    And every token has a log-probability

  @EXT-016.3 @any
  Scenario: Greedy output through /v1/chat/completions is token for token the same as through /execute
    Given a worker on the reference model
    When I run this greedy chat through /execute and the async-openai client:
      """
      {"messages": [{"role": "user", "content": "Write a haiku about GPU computing"}], "max_tokens": 24}
      """
    Then both front doors gave the same tokens with the same log-probabilities

  @EXT-016.4 @any
  Scenario: Refusals reach the client as typed errors naming the field, and the API is documented
    Given a worker on the reference model
    Then the async-openai client gets 400 naming "n" for:
      """
      {"messages": [{"role": "user", "content": "hi"}], "n": 0}
      """
    And the async-openai client gets 400 naming "temperature" for:
      """
      {"messages": [{"role": "user", "content": "hi"}], "temperature": 3.5}
      """
    And the async-openai client gets 400 naming "modalities" for:
      """
      {"messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"]}
      """
    And the async-openai client gets 404 for model "gpt-4o"
    And /openapi.json documents "/execute, /cancel, /health, /v1/chat/completions, /v1/completions, /v1/models"
    And /health says "healthy"

  @EXT-043.14 @any
  Scenario: Several choices of one request, each what its own seed gives, whole and streamed
    Given a worker on the reference model with flags "--parallel 4"
    When the async-openai client asks for 3 choices of this chat whole and streamed:
      """
      {"messages": [{"role": "user", "content": "Name a colour and say why you like it."}],
       "max_tokens": 12, "temperature": 1.0, "seed": 7}
      """
    Then choice i is the one-choice answer with seed plus i, whole and streamed alike
    And the usage counts the prompt once and every choice's tokens, whole and streamed
    And /metrics counted the first request's prompt computed once and attached by its other choices
    And the async-openai client gets 400 naming "n" for:
      """
      {"messages": [{"role": "user", "content": "hi"}], "n": 17}
      """
