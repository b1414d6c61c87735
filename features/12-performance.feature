Feature: Performance budgets
  Budgets per backend live in budgets.yaml (harness/src/budgets.rs); each @bench
  scenario measures one and compares it with 10% slack. They are slow on a 2-core
  CPU and are excluded from CI's default filter; run them with --tags @bench.

  @M0-W-1600 @bench
  Scenario: Time to first token over 100 sequential jobs
    Given a worker on the reference model
    When I run 100 sequential jobs of 2 tokens on a short prompt
    Then the "first_token_ms_p95" budget holds for the client's time to first token
    And the "first_token_ms_p95" budget holds for the worker's first_token_ms

  @M0-W-1601 @bench
  Scenario Outline: Decode throughput per model (<model>)
    Given a worker on the "<model>" model
    When I run 5 sequential jobs of 64 tokens on a short prompt
    Then the "decode_tok_s_min.<key>" budget holds for the median decode rate

    Examples:
      | model     | key                        |
      | reference | smollm2-135m-instruct-q4_1 |

    @cuda
    Examples:
      | model                  | key          |
      | synthetic-qwen2.5-0.5b | qwen2.5-0.5b |
      | synthetic-llama-3-8b   | llama-3-8b   |

    @cuda
    Examples:
      | model                 | key         |
      | synthetic-gpt-oss-20b | gpt-oss-20b |

  @M0-W-1602 @bench
  Scenario: Gaps between tokens over 100 jobs
    Given a worker on the reference model
    When I run 100 sequential jobs of 16 tokens on a short prompt
    Then the "inter_token_ms_p95" budget holds for the gaps between token events

  @M0-W-1603 @bench
  Scenario: Parsing and validating the largest valid /execute body
    When I run the criterion benchmark "execute_parse"
    Then the "execute_parse_ms" budget holds for the benchmark's mean time

  @M0-W-1604 @bench
  Scenario: /health latency during a long job
    Given a worker on the reference model
    When I start the job:
      """
      {"job_id": "w1604", "prompt": "Count upward: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 2048, "temperature": 0}
      """
    And job "w1604" has streamed 1 tokens
    And I call /health 1000 times
    Then the "health_ms_p99" budget holds for the /health latency
    And job "w1604" was still streaming afterwards

  @M0-W-1610 @bench
  Scenario: Cancellation latency over 50 runs
    Given a worker on the reference model
    When I cancel 50 long jobs after 3 tokens each
    Then the "cancel_ms_p95" budget holds for the time from /cancel to the terminal event

  @M0-W-1611 @any
  Scenario: A client that disconnects aborts its job and the next job starts at once
    Given a worker on the reference model
    When I scrape /metrics
    And I start the job:
      """
      {"job_id": "w1611-gone", "prompt": "Count upward: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 2048, "temperature": 0}
      """
    And job "w1611-gone" has streamed 3 tokens
    And I disconnect from job "w1611-gone"
    And I run the job:
      """
      {"job_id": "w1611-next", "prompt": "Hello", "max_tokens": 2, "temperature": 0}
      """
    And I scrape /metrics again
    Then job "w1611-next"'s first token arrived within 5 s
    And "worker_requests_total{outcome="disconnected"}" rose by 1

  @M0-W-1620 @bench
  Scenario: Model load time over 5 cold starts
    When I time 5 cold starts of the worker to "ready"
    Then the "load_s.smollm2-135m-instruct-q4_1" budget holds for the maximum load time

  @M0-W-1621 @any
  Scenario: Load progress is logged at 0, 25, 50, 75 and 100 percent in order
    Given a worker on the reference model
    Then the log has "model_load_progress" percent 0, 25, 50, 75, 100 in order between "model_load_start" and "model_load_complete"

  @M0-W-1630 @bench
  Scenario: Shutdown during a long job, 20 times
    When I time 20 SIGTERM shutdowns during a long job
    Then the "shutdown_ms_max" budget holds for the maximum
