Feature: One process, one model
  A worker is one OS process that loads the model named at start and serves only
  that model until it exits (REQUIREMENTS.md section 1).

  @M0-SYS-6.3.1 @any
  Scenario: A worker started with flags only serves a job
    # Started with the required flags only: no --callback-url, so no ready callback
    # (the callback that --callback-url asks for is covered by M0-W-1100's flag tests).
    Given a worker on the reference model
    Then /health says "healthy"
    When I run the job:
      """
      {"job_id": "sys-631", "prompt": "Say hello.", "max_tokens": 4, "temperature": 0}
      """
    Then job "sys-631" streamed started, at least 1 token and end

  @M0-SYS-6.3.2 @cuda
  Scenario: Two workers share one GPU and killing one leaves the other serving
    Given a worker on the reference model
    And a second worker on the reference model
    When I run the job:
      """
      {"job_id": "sys-632-a", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
      """
    And I kill the second worker
    Then the second worker has exited
    And /health says "healthy"
    When I run the job:
      """
      {"job_id": "sys-632-b", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
      """
    Then jobs "sys-632-a" and "sys-632-b" produced the same token ids

  @M0-W-1001 @any
  Scenario: The model named at start is the only one ever served
    Given a worker on the reference model
    When I remember /health
    And I run the job:
      """
      {"job_id": "w1001", "prompt": "Name a colour.", "max_tokens": 4, "temperature": 0}
      """
    # There is no second load to refuse: the engine takes its model by value at start and
    # has no way to load another (worker/src/engine/runner.rs), so what is left to check is
    # that what it serves never changes.
    Then /health field "model" is unchanged

  @M0-W-1002 @any
  Scenario: The same greedy request gives the same ids at job 1 and job 20
    Given a worker on the reference model
    When I run this job 20 times:
      """
      {"job_id": "w1002", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}
      """
    Then all 20 runs produced the same token ids
    And /health reports the residency of the launched backend
