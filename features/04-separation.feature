Feature: Process separation and the backend boundary
  The worker is a standalone process; device work happens only behind the backend
  (REQUIREMENTS.md section 4).

  @M0-SYS-2.4.1 @any
  Scenario: The suite drives the worker as a child process over HTTP and signals
    Given a worker on the reference model
    Then the worker is a separate child process of the suite
    When I send SIGTERM to the worker
    Then the worker exits with code 0 within 30 s

  @M0-SYS-2.4.2 @cuda
  Scenario: The driver lists the worker's own process using memory on the GPU
    Given a worker on the reference model
    Then nvidia-smi lists the worker's PID with memory in use

  @M0-SYS-2.5.1 @cuda
  Scenario: Loading then dropping an engine returns the driver's free memory
    Then the worker's unit tests named "m0_sys_2_5_1" pass

  @M0-W-1050 @any
  Scenario: Host layers never touch cudarc and handlers are tested with a mock backend
    Then no source file under "worker/src" outside "worker/src/backend/cuda" mentions "cudarc"
    And the worker's unit tests named "server::tests::" pass

  @M0-W-1051 @cuda
  Scenario: The CUDA backend module's own tests pass on a GPU
    Then the worker's unit tests named "backend::cuda::" pass

  @M0-W-1052 @any
  Scenario: One generic Backend trait suite passes on each backend
    Then the worker's unit tests named "m0_w_1052" pass on this backend
