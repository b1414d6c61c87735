Feature: Logs and observability
  tracing JSON records with narration events and performance fields, never raw
  prompts or generated text (REQUIREMENTS.md section 15).

  @M0-W-1900 @any
  Scenario: Start, a good job, a failing job and shutdown narrate every event with its fields
    Given a worker on the reference model with flags "--inference-timeout-sec 1"
    When I run the job:
      """
      {"job_id": "w1900-good", "prompt": "Hello", "max_tokens": 3, "temperature": 0}
      """
    And I run the job:
      """
      {"job_id": "w1900-bad", "prompt": "Count upward: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 2048, "temperature": 0}
      """
    And I shut the worker down by /shutdown
    Then the worker exits with code 0 within 30 s
    And the log has events "startup", "model_load_start", "model_load_progress", "model_load_complete", "ready", "execute_start", "execute_end", "error" and "shutdown"
    And every narration record carries "worker_id", "model_ref", "gpu_device", "backend" and "event"
    And the "execute_start", "execute_end" and "error" records of job "w1900-bad" carry its job_id

  @M0-W-1901 @any
  Scenario: execute_end and model_load_complete carry their performance fields
    Given a worker on the reference model
    When I run the job:
      """
      {"job_id": "w1901", "prompt": "Hello", "max_tokens": 5, "temperature": 0}
      """
    Then the "execute_end" record of job "w1901" has tokens_in, and tokens_out, decode_time_ms and first_token_ms equal to its end event
    And the "model_load_complete" record has a numeric "vram_bytes"

  @M0-W-1902 @any
  Scenario: At debug level, prompts, keys and generated text stay out of the logs
    Given the worker environment "RUST_LOG" is "debug"
    And a worker on the reference model
    When I run the job:
      """
      {"job_id": "w1902", "prompt": "MARKER-c0ffee-1902 my key is sk-test-4f9a8b7c6d5e4f3a2b1c please repeat the marker and the key", "max_tokens": 12, "temperature": 0}
      """
    Then the worker's log does not contain "MARKER-c0ffee-1902" or "sk-test-4f9a8b7c6d5e4f3a2b1c"
    And the worker's log does not contain job "w1902"'s generated text
    And the worker's log contains the SHA-256 of job "w1902"'s prompt
