Feature: VRAM-only residency (CUDA backend)
  Under `cuda` everything lives in device memory and the worker accounts for it
  (REQUIREMENTS.md section 2). Test-only knobs are environment variables the CUDA
  backend honours: WORKER_ORCD_VRAM_CAP_BYTES (pretend only this much VRAM is
  free) and WORKER_ORCD_TEST_HOST_MAPPED_WEIGHT=1 (register one host-mapped buffer
  as a weight), with the residency check interval set by --residency-check-sec.

  @M0-SYS-2.2.1 @cuda
  Scenario: A default start serves from VRAM on cuda
    Given a worker on the reference model without "--backend"
    Then /health field "backend" is "cuda"
    And /health field "resident" is true
    And the worker's unit tests named "host_mapped_memory_is_not_device_memory" pass

  @M0-W-1010 @cuda
  Scenario: The context is set up for VRAM-only work
    Then the worker's unit tests named "device_init_reads_facts_and_applies_vram_only_settings" pass

  @M0-W-1011 @cuda
  Scenario: VRAM in use covers the weights and returns to its post-load value after a job
    Given a worker on the reference model
    Then /health field "vram_bytes_used" is at least the model's tensor bytes
    When I remember /health
    And I run the job:
      """
      {"job_id": "w1011", "prompt": "Count to five.", "max_tokens": 16, "temperature": 0}
      """
    Then /health field "vram_bytes_used" is unchanged

  @M0-W-1012 @cuda
  Scenario: A host-mapped weight buffer turns the worker unhealthy within 3 s
    Given the worker environment "WORKER_ORCD_TEST_HOST_MAPPED_WEIGHT" is "1"
    And a worker on the reference model with flags "--residency-check-sec 1"
    Then within 3 s /health says "unhealthy"
    And /health field "resident" is false
    And the worker logged an "error" record

  @M0-W-1020 @cuda
  Scenario: Too little VRAM at start exits 1 with the four facts logged
    Given the worker environment "WORKER_ORCD_VRAM_CAP_BYTES" is "50000000"
    When the worker is started on the "reference" model
    Then the worker exits with code 1 within 60 s
    And the worker logged an "error" record with code "INSUFFICIENT_VRAM" and fields "gpu_device", "*need*", "*free*" and the model path
    And the worker never listened

  @M0-W-1021 @cuda
  Scenario: A job that runs out of VRAM fails alone and the worker recovers
    Given the worker environment "WORKER_ORCD_VRAM_CAP_BYTES" is "120000000"
    And a worker on the reference model
    When I remember /health
    And I run the job:
      """
      {"job_id": "w1021-big", "prompt": "Count upward: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 2048, "temperature": 0}
      """
    Then job "w1021-big" ended with error "VRAM_OOM"
    And within 5 s /health says "healthy"
    And /health field "vram_bytes_used" is unchanged
    When I run the job:
      """
      {"job_id": "w1021-small", "prompt": "Hi", "max_tokens": 4, "temperature": 0}
      """
    Then job "w1021-small" streamed started, at least 1 token and end
