Feature: Reading and placing the model
  GGUF v3 only, checked before any allocation, metadata read into a typed config,
  architecture picks the adapter (REQUIREMENTS.md section 6). Bad files are made
  from the reference model by the harness (harness/src/fixtures.rs).

  @M0-W-1200 @any
  Scenario: Version 3 loads and version 2 is refused by name
    Given a worker on the reference model
    Then /health says "healthy"
    When I stop the worker
    And the worker is started on the "gguf-v2" model
    Then the worker exits with code 1 within 30 s
    And the worker's output mentions "version" and "2"

  @M0-W-1201 @cuda
  Scenario: Weights stay in their stored format in VRAM
    Given a worker on the reference model
    Then /health field "quant_kind" is "Q4_1"
    And the worker's unit tests named "m0_w_1201" pass

  @M0-W-1210 @any
  Scenario Outline: A bad file is refused before loading (<model>)
    When the worker is started on the "<model>" model
    Then the worker exits with code 1 within 30 s
    And the worker did not panic
    And the worker never listened

    Examples:
      | model           |
      | bad-magic       |
      | gguf-v1         |
      | 10001-tensors   |
      | tensor-past-eof |

  @M0-W-1211 @any
  Scenario: Header and metadata are read, and a missing key is named
    Given a worker on the reference model
    Then /health field "context_length" is 8192
    And the worker's unit tests named "gguf::tests::reference_model_smollm2" pass
    When I stop the worker
    And the worker is started on the "missing-block-count" model
    Then the worker exits with code 1 within 30 s
    And the worker's output mentions "block_count"

  @M0-W-1212 @any
  Scenario Outline: general.architecture picks the adapter (<model>)
    When the worker is started on the "<model>" model
    Then the start <outcome>

    Examples:
      | model        | outcome                  |
      | reference    | serves                   |
      | arch-qwen2   | serves                   |
      | gemma3       | serves                   |
      | arch-mamba   | fails naming "mamba"     |

    Examples:
      | model               | outcome |
      | synthetic-tiny-phi3 | serves  |
      | synthetic-tiny-gpt2 | serves  |

    # RoPE frequency factors: Phi-3 128k's LongRoPE, Llama 3.1's rope_freqs.
    Examples:
      | model                    | outcome |
      | synthetic-tiny-phi3-128k | serves  |
      | synthetic-tiny-llama3.1  | serves  |

    Examples:
      | model             | outcome |
      | synthetic-gpt-oss | serves  |

    # Issue 46: Qwen3 dense and MoE, and Mistral Nemo's explicit head size.
    Examples:
      | model                   | outcome |
      | synthetic-tiny-qwen3    | serves  |
      | synthetic-tiny-qwen3moe | serves  |
      | synthetic-tiny-mistral  | serves  |

  @M0-W-1220 @cuda
  Scenario: Weight buffers are 256-byte aligned and freed on drop
    Then the worker's unit tests named "m0_w_1220" pass

  @M0-W-1221 @cuda
  Scenario: A 2 GB model loads through a memory map without heap copies
    When the worker is started on the "synthetic-llama-2gb" model while sampling its memory
    Then the worker becomes healthy within 120 s
    And the peak RssAnon while loading stayed under 256 MiB

  @M0-W-1222 @cuda
  Scenario: Host-to-device copies go in chunks straight from the map
    Then the worker's unit tests named "m0_w_1222" pass

  @M0-W-1230 @any
  Scenario Outline: Each test model loads, reports itself and matches the CPU (<model>)
    Given a worker on the "<model>" model
    Then /health says "healthy"
    And the first-step logits match the CPU reference on the "<model>" model

    Examples:
      | model     |
      | reference |

    @cuda
    Examples:
      | model                  |
      | synthetic-qwen2.5-0.5b |
      | synthetic-llama-3-8b   |
      | gemma3                 |

    @cuda
    Examples:
      | model          |
      | synthetic-phi3 |
      | synthetic-gpt2 |

    @cuda
    Examples:
      | model                    |
      | synthetic-tiny-phi3-128k |
      | synthetic-tiny-llama3.1  |

    @cuda
    Examples:
      | model                 |
      | synthetic-gpt-oss-20b |

    @cuda
    Examples:
      | model                   |
      | synthetic-tiny-qwen3    |
      | synthetic-tiny-qwen3moe |
      | synthetic-tiny-mistral  |
