Feature: Faults production brings
  The worker keeps its promise of one terminal event per accepted job under
  what production does to a running process (issue 47).

  @EXT-047.1 @any
  Scenario Outline: The model file truncated, then overwritten in place, under a running worker on <backend>
    Given a worker with --backend <backend> on a copy of the reference model
    Then the worker maps no model file
    When I run the job:
      """
      {"job_id": "before", "prompt": "Say hello.", "max_tokens": 8, "temperature": 0}
      """
    Then job "before" streamed started, at least 1 token and end
    When the model file's copy is truncated to 0 bytes
    And I run the job:
      """
      {"job_id": "truncated", "prompt": "Say hello.", "max_tokens": 8, "temperature": 0}
      """
    Then job "truncated" streamed started, at least 1 token and end
    When the model file's copy is overwritten in place with as many bytes of garbage
    And I run the job:
      """
      {"job_id": "overwritten", "prompt": "Say hello.", "max_tokens": 8, "temperature": 0}
      """
    Then job "overwritten" streamed started, at least 1 token and end
    And jobs "before", "truncated" and "overwritten" produced the same token ids
    And /health field "status" is "healthy"

    Examples:
      | backend |
      | cpu     |

    @cuda
    Examples:
      | backend |
      | cuda    |

  @EXT-047.2 @cuda
  Scenario: A GPU fault mid-job ends every job once and the worker exits for a restart
    Given a worker built with fault injection on the reference model with --parallel 16
    When I start 16 jobs that do not end by themselves
    And each of the 16 jobs has streamed 4 tokens
    And the worker's next kernel launch fails
    Then each of the 16 jobs ended with one error "INFERENCE_FAILED", retriable
    And the worker exits with code 3 within 5 s
    And the worker logged a "shutdown" record
