Feature: Long context
  Prompts and replies as long as the context allows: /execute keeps M0-W-1300's
  caps as its defaults, the /v1 routes are bounded by the context (issue 45).

  @EXT-045.1 @any
  Scenario: /execute's caps are defaults and flags; the /v1 routes are bounded by the context
    Given a worker on the reference model
    When I post to /execute:
      """
      {"job_id": "e451-a", "prompt": "{chars:32769}", "max_tokens": 2}
      """
    Then the reply is 400 "INVALID_REQUEST" naming "prompt"
    When I post to /execute:
      """
      {"job_id": "e451-b", "prompt": "Say hello.", "max_tokens": 2049}
      """
    Then the reply is 400 "INVALID_REQUEST" naming "max_tokens"
    When the async-openai client runs this chat completion whole and streamed:
      """
      {"messages": [{"role": "user", "content": "{chars:40000}Name three colours."}], "max_tokens": 4, "temperature": 0}
      """
    Then both answers are the same 4 tokens, finished with "length"
    When the async-openai client runs this chat completion whole and streamed:
      """
      {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 3000, "temperature": 0}
      """
    Then both answers are the same, finished with "stop"
    And the async-openai client gets 400 naming "max_tokens" for:
      """
      {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8192}
      """
    When I send SIGTERM to the worker
    Then the worker exits with code 0 within 30 s
    Given a worker on the reference model with flags "--max-prompt-chars 40000 --max-tokens-out 3000"
    When I run the job:
      """
      {"job_id": "e451-c", "prompt": "{chars:40000}", "max_tokens": 2, "temperature": 0}
      """
    Then job "e451-c" streamed started, at least 1 token and end
    When I run the job:
      """
      {"job_id": "e451-d", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 3000, "temperature": 0}
      """
    Then job "e451-d" streamed started, at least 1 token and end
    And the async-openai client gets 400 naming "max_tokens" for:
      """
      {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 3001}
      """
    When I send SIGTERM to the worker
    Then the worker exits with code 0 within 30 s
    When the worker is started on the reference model with flags "--max-tokens-out 8192"
    Then the worker exits with code 1 within 60 s
    And the worker's output names the flag "max-tokens-out"

  @EXT-045.2 @any
  Scenario: The KV cache's type is a flag: f16, q8_0 or q4_0
    Given a worker on the reference model
    Then /health field "kv_cache.type" is "f16"
    When I remember /health
    When I send SIGTERM to the worker
    Then the worker exits with code 0 within 30 s
    Given a worker on the reference model with flags "--kv-type q8_0 --parallel 2"
    Then /health field "kv_cache.type" is "q8_0"
    And on cuda /health field "kv_cache.bytes_per_token" is at most 0.54 times the remembered one
    When I run the job:
      """
      {"job_id": "e452-q8", "prompt": "Write a haiku about the sea.", "max_tokens": 24, "temperature": 0}
      """
    Then job "e452-q8" streamed started, at least 1 token and end
    When I send SIGTERM to the worker
    Then the worker exits with code 0 within 30 s
    Given a worker on the reference model with flags "--kv-type q4_0 --parallel 2"
    Then /health field "kv_cache.type" is "q4_0"
    And on cuda /health field "kv_cache.bytes_per_token" is at most 0.29 times the remembered one
    When I run the job:
      """
      {"job_id": "e452-q4", "prompt": "Write a haiku about the sea.", "max_tokens": 24, "temperature": 0}
      """
    Then job "e452-q4" streamed started, at least 1 token and end
    When I send SIGTERM to the worker
    Then the worker exits with code 0 within 30 s
    When the worker is started on the reference model with flags "--kv-type q5_1"
    Then the worker exits with code 2 within 60 s
    And the worker's output names the flag "kv-type"
