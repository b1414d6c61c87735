Feature: Errors
  Stable codes with fixed HTTP statuses and retriable flags, the same body outside
  and inside a stream (REQUIREMENTS.md section 11).

  @M0-W-1500 @any
  # 1 s, as in M0-W-1311's timeout example: on the H200 the 2048-token job ends in 1.7 s.
  Scenario: INVALID_REQUEST, QUEUE_FULL and INFERENCE_TIMEOUT are triggered with their statuses
    Given a worker on the reference model with flags "--queue-depth 1 --inference-timeout-sec 1"
    When I post to /execute:
      """
      {"job_id": "", "prompt": "hi"}
      """
    Then the reply is 400 "INVALID_REQUEST"
    When I start the job:
      """
      {"job_id": "w1500-run", "prompt": "Count upward: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 2048, "temperature": 0}
      """
    And job "w1500-run" has streamed its started event
    And I start the job:
      """
      {"job_id": "w1500-queued", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
      """
    And job "w1500-queued" has streamed its started event
    And I post to /execute:
      """
      {"job_id": "w1500-full", "prompt": "Hello", "max_tokens": 4}
      """
    Then the reply is 503 "QUEUE_FULL"
    And the reply's error is retriable
    When all jobs end
    Then job "w1500-run" ended with error "INFERENCE_TIMEOUT"
    And the worker's unit tests named "codes_strings_statuses_and_retriable_are_pinned" pass

  @M0-W-1501 @any
  Scenario: Backend error kinds map to fixed messages and codes
    Then the worker's unit tests named "every_backend_error_maps_in_both_phases" pass

  @M0-W-1510 @any
  Scenario: A failure after the stream opens is an error event with typed fields and no prompt text
    Given a worker on the reference model with flags "--inference-timeout-sec 1"
    When I run the job:
      """
      {"job_id": "w1510", "prompt": "SECRET-PROMPT-MARKER-1510 tell me a very long story.", "max_tokens": 2048, "temperature": 0}
      """
    Then job "w1510" ended with error "INFERENCE_TIMEOUT"
    And job "w1510"'s error has a string code, a string message and a boolean retriable
    And job "w1510"'s error message does not contain "SECRET-PROMPT-MARKER-1510"
