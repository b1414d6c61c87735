Feature: GPU engine internals
  Context, teardown, loading sequence, forward step, sampling and stop sequences
  (REQUIREMENTS.md section 10).

  @M0-W-1400 @cuda
  Scenario: Context creation compiles every module and refuses device id = count
    Then the worker's unit tests named "device_id_equal_to_the_count_is_invalid" pass
    When the worker is started on the reference model with flags "--gpu-device {gpu_count}"
    Then the worker exits with code 1 within 30 s
    And the worker's output mentions "device"

  @M0-W-1401 @cuda
  Scenario: After SIGTERM the process exits 0 and holds no GPU memory
    Given a worker on the reference model
    When I send SIGTERM to the worker
    Then the worker exits with code 0 within 30 s
    And nvidia-smi no longer lists the worker's PID

  @M0-W-1410 @any
  Scenario: Loading follows map, parse, validate, allocate, copy; a cut file fails before allocating
    Then the worker's unit tests named "m0_w_1410" pass
    When the worker is started on the "cut-mid-tensor" model
    Then the worker exits with code 1 within 30 s
    And the worker did not panic
    And the worker logged no "model_load_progress" record

  @M0-W-1420 @cuda
  Scenario: CUDA logits over 8 greedy steps match the CPU with the same argmax
    Given a worker on the reference model
    Then 8 greedy steps on the "reference" model match the CPU backend within 0.1 nats with the same argmax

  @M0-W-1421 @any
  Scenario: The sampling pipeline: top_k 1 is greedy at any temperature; filters are unit-tested
    Given a worker on the reference model
    When I run the job:
      """
      {"job_id": "w1421-greedy", "prompt": "Fruits are", "max_tokens": 8, "temperature": 0}
      """
    And I run the job:
      """
      {"job_id": "w1421-topk1", "prompt": "Fruits are", "max_tokens": 8, "temperature": 1.5, "top_k": 1, "seed": 7}
      """
    Then jobs "w1421-greedy" and "w1421-topk1" produced the same token ids
    And the worker's unit tests named "sampling::" pass

  @M0-W-1422 @any
  Scenario: A stop string spanning two tokens cuts the stream just before it
    Given a worker on the reference model
    When I run golden case 1 with stop "e dep", temperature 0 and max_tokens 8 as job "w1422"
    Then job "w1422"'s text is exactly "In th"
    And job "w1422" ended with stop_reason "stop_sequence" and stop_sequence "e dep"

  @M0-W-1430 @cuda
  Scenario: Every kernel matches the CPU at synthetic shapes and every .cu compiles
    Then the worker's unit tests named "_matches_cpu" pass

  @M0-W-1431 @cuda
  Scenario: Kernels and launchers refuse bad sizes; memcheck is clean
    Then the worker's unit tests named "m0_w_1431" pass
    And the worker's unit tests named "m0_w_1431_compute_sanitizer_memcheck_is_clean" pass
