Feature: HTTP interface
  POST /execute streams SSE; /cancel, /shutdown, /health and /metrics control and
  observe the worker (REQUIREMENTS.md section 7).

  @M0-W-1300 @any
  Scenario: Prompt-only, messages-only and all-fields bodies each open an event stream
    Given a worker on the reference model
    When I post to /execute with header "X-Deadline: 2030-01-01T00:00:00Z":
      """
      {"job_id": "w1300-a", "prompt": "Hello", "max_tokens": 2}
      """
    Then the reply is 200 with content type "text/event-stream"
    When I post to /execute:
      """
      {"job_id": "w1300-b", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}], "max_tokens": 2}
      """
    Then the reply is 200 with content type "text/event-stream"
    When I post to /execute:
      """
      {"job_id": "w1300-c", "prompt": "Hello", "max_tokens": 3, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "repetition_penalty": 1.1, "min_p": 0.05, "stop": ["\n\n", "###"], "seed": 42, "logprobs": 5}
      """
    Then the reply is 200 with content type "text/event-stream"
    And every job streamed a conformant transcript

  @M0-W-1301 @any
  Scenario: Two jobs posted together never run alongside
    Given a worker on the reference model
    When I post these jobs at once:
      """
      [{"job_id": "w1301-1", "prompt": "First job", "max_tokens": 8, "temperature": 0},
       {"job_id": "w1301-2", "prompt": "Second job", "max_tokens": 8, "temperature": 0}]
      """
    And all jobs end
    Then jobs "w1301-1" and "w1301-2" ended with "end"
    And the accepted jobs ran one at a time in the order they were accepted

  @M0-W-1302 @any
  Scenario Outline: An invalid request is refused with 400 before queueing (<rule>)
    Given a worker on the reference model with flags "--max-tokens-in 64"
    When I post to /execute the body <body>
    Then the reply is 400 "INVALID_REQUEST" naming "<field>"
    And the reply is not an event stream

    Examples:
      | rule              | field              | body |
      | empty job_id      | job_id             | {"job_id": "", "prompt": "hi"} |
      | max_tokens 0      | max_tokens         | {"job_id": "a", "prompt": "hi", "max_tokens": 0} |
      | max_tokens 2049   | max_tokens         | {"job_id": "a", "prompt": "hi", "max_tokens": 2049} |
      | temperature 2.1   | temperature        | {"job_id": "a", "prompt": "hi", "temperature": 2.1} |
      | top_p 1.5         | top_p              | {"job_id": "a", "prompt": "hi", "top_p": 1.5} |
      | top_k over vocab  | top_k              | {"job_id": "a", "prompt": "hi", "top_k": 49153} |
      | min_p 1.5         | min_p              | {"job_id": "a", "prompt": "hi", "min_p": 1.5} |
      | penalty 2.5       | repetition_penalty | {"job_id": "a", "prompt": "hi", "repetition_penalty": 2.5} |
      | 5 stops           | stop               | {"job_id": "a", "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]} |
      | logprobs 21       | logprobs           | {"job_id": "a", "prompt": "hi", "logprobs": 21} |
      | negative seed     | seed               | {"job_id": "a", "prompt": "hi", "seed": -1} |
      | both inputs       | messages           | {"job_id": "a", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]} |
      | neither input     | prompt             | {"job_id": "a"} |
      | empty prompt      | prompt             | {"job_id": "a", "prompt": ""} |
      | unknown role      | role               | {"job_id": "a", "messages": [{"role": "wizard", "content": "hi"}]} |
      | reasoning_effort max | reasoning_effort | {"job_id": "a", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "max"} |
      | reasoning_effort with a prompt | reasoning_effort | {"job_id": "a", "prompt": "hi", "reasoning_effort": "low"} |
      | chat_template_kwargs not an object | chat_template_kwargs | {"job_id": "a", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": "enable_thinking"} |
      | chat_template_kwargs hiding messages | chat_template_kwargs | {"job_id": "a", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"messages": []}} |
      | chat_template_kwargs with a prompt | chat_template_kwargs | {"job_id": "a", "prompt": "hi", "chat_template_kwargs": {"enable_thinking": false}} |
      | over max-tokens-in | prompt            | {"job_id": "a", "prompt": "word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word"} |

  @M0-W-1310 @any
  Scenario: Every frame is one event line and one JSON data line, flushed as produced
    Given a worker on the reference model
    When I run the job:
      """
      {"job_id": "w1310", "prompt": "List some fruits:", "max_tokens": 16, "temperature": 0}
      """
    Then job "w1310" has conformant SSE framing
    And job "w1310"'s tokens arrived spread over its decode time

  @M0-W-1311 @any
  # The timeout example gets 1 s: its 2048-token job must outlast the limit on any backend, and
  # on a fast GPU it finishes within 4 s.
  Scenario Outline: Every kind of job ends with exactly one terminal event (<kind>)
    Given a worker on the reference model with flags "--inference-timeout-sec <timeout>"
    When a job ends by "<kind>"
    Then every job streamed started, tokens, then one terminal event and nothing after

    Examples:
      | kind          | timeout |
      | max_tokens    | 4       |
      | stop_sequence | 4       |
      | eos           | 4       |
      | cancel        | 4       |
      | timeout       | 1       |
      | shutdown      | 4       |

  @M0-W-1312 @any
  Scenario: Event payloads follow the schema in this and every earlier transcript
    Given a worker on the reference model
    When I run the job:
      """
      {"job_id": "w1312-a", "prompt": "Colours:", "max_tokens": 6, "temperature": 0, "logprobs": 5}
      """
    And I run the job:
      """
      {"job_id": "w1312-b", "prompt": "Count: one, two,", "max_tokens": 16, "temperature": 0, "stop": [" four"]}
      """
    Then every job streamed a conformant transcript
    And at temperature 0 every token of job "w1312-a" is its top log-probability
    And every transcript recorded so far in this run is conformant

  @M0-W-1320 @any
  Scenario: /health describes the reference model with typed fields
    Given a worker on the reference model
    Then /health has the typed fields of REQUIREMENTS.md
    And /health field "quant_kind" is "Q4_1"
    And /health field "tokenizer_kind" is "gguf-bpe"
    And /health field "vocab_size" is 49152
    And /health field "context_length" is 8192
    And /health field "backend" is the launched backend
    And /health reports the residency of the launched backend

  @M0-SYS-6.3.5 @any
  Scenario: A queued job is cancelled without tokens and the running job is unaffected
    Given a worker on the reference model
    When I run the job:
      """
      {"job_id": "sys-635-solo", "prompt": "Write a list of animals:", "max_tokens": 12, "temperature": 0}
      """
    And I start the job:
      """
      {"job_id": "sys-635-1", "prompt": "Write a list of animals:", "max_tokens": 12, "temperature": 0}
      """
    And I start the job:
      """
      {"job_id": "sys-635-2", "prompt": "Anything", "max_tokens": 12, "temperature": 0}
      """
    And I cancel job "sys-635-2"
    And all jobs end
    Then job "sys-635-2" ended with error "CANCELLED" after 0 tokens
    And jobs "sys-635-solo" and "sys-635-1" produced the same token ids
    And job "sys-635-1" ended with "end"

  @M0-W-1330 @any
  Scenario: Cancelling a long job thrice after token 5 ends it once with CANCELLED
    Given a worker on the reference model
    When I remember /health
    And I start the job:
      """
      {"job_id": "w1330", "prompt": "Count upward: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 2048, "temperature": 0}
      """
    And job "w1330" has streamed 5 tokens
    And I cancel job "w1330" 3 times
    Then every cancel reply was 202
    And job "w1330" ends within 5 s
    And job "w1330" ended with error "CANCELLED" after at least 5 tokens
    And job "w1330"'s error is not retriable
    When I cancel job "w1330"
    And I cancel job "never-existed"
    Then every cancel reply was 202
    And on cuda /health field "vram_bytes_used" is unchanged

  @M0-W-1340 @any
  Scenario Outline: Shutdown finishes or cancels the running job, cancels the queue and exits 0 (<how>)
    Given a worker on the reference model
    When I start the job:
      """
      {"job_id": "w1340-run", "prompt": "Count upward: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 2048, "temperature": 0}
      """
    And job "w1340-run" has streamed 1 tokens
    And I start the job:
      """
      {"job_id": "w1340-queued", "prompt": "Anything", "max_tokens": 8, "temperature": 0}
      """
    And job "w1340-queued" has streamed its started event
    And I shut the worker down by <how>
    And I post to /execute:
      """
      {"job_id": "w1340-late", "prompt": "Too late", "max_tokens": 2}
      """
    Then the reply is 503 "SHUTTING_DOWN"
    And job "w1340-queued" ended with error "CANCELLED" after 0 tokens
    And job "w1340-queued"'s error is retriable
    And job "w1340-run" ended with "end" or error "CANCELLED"
    And the worker exits with code 0 within 30 s
    And the worker logged a "shutdown" record

    Examples:
      | how       |
      | /shutdown |
      | SIGTERM   |

  @M0-W-1350 @any
  Scenario Outline: /metrics counts a job's request and tokens (<model>)
    Given a worker on the "<model>" model
    When I scrape /metrics
    And I run the job:
      """
      {"job_id": "w1350", "prompt": "Hello", "max_tokens": 5, "temperature": 0}
      """
    And I scrape /metrics again
    Then both scrapes parse as Prometheus text
    And the scrape has "worker_vram_bytes", "worker_requests_total", "worker_tokens_generated_total", "worker_inference_duration_ms_bucket", "worker_uptime_seconds"
    And some metric carries the label "quant_kind"
    And "worker_requests_total" rose by 1
    And "worker_tokens_generated_total" rose by job "w1350"'s tokens_out
    And the scrape's "worker_active_expert_count" is <active>
    And the scrape's "worker_expert_count" is <experts>

    Examples:
      | model     | active | experts |
      | reference | absent | absent  |

    # gpt-oss (the small preset: 4 experts, 2 a token).
    Examples:
      | model             | active | experts |
      | synthetic-gpt-oss | 2      | 4       |
