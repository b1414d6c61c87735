Feature: Tokenizers
  The tokenizer is chosen at load from GGUF metadata and matches llama.cpp's ids
  (REQUIREMENTS.md section 8). Golden vectors: testdata/golden/tokenize.json.

  @M0-W-1360 @any
  Scenario Outline: The tokenizer kind follows tokenizer.ggml.model (<model>)
    When the worker is started on the "<model>" model with flags "<flags>"
    Then the start <outcome>

    Examples:
      | model          | flags | outcome                          |
      | reference      |       | serves with tokenizer "gguf-bpe" |
      | tokenizer-rwkv |       | fails naming "rwkv"              |

    Examples:
      | model               | flags | outcome                          |
      | synthetic-tiny-phi3 |       | serves with tokenizer "gguf-spm" |

    Examples:
      | model                    | flags               | outcome                         |
      | reference-tokenizer-json | --tokenizer hf-json | serves with tokenizer "hf-json" |

  @M0-W-1361 @any
  Scenario: hf-json loads a tokenizer.json beside the model and encodes the goldens like gguf-bpe
    When the worker is started on the "reference-tokenizer-json" model with flags "--tokenizer hf-json"
    Then the start serves with tokenizer "hf-json"
    And every golden tokenizer vector encodes to its ids through /tokenize
    And /health field "vocab_size" equals the model file's vocabulary size

  @M0-W-1362 @any
  Scenario Outline: GGUF tokenizers are built from metadata and pass their goldens (<kind>)
    Given a worker on the "<model>" model
    Then /health field "tokenizer_kind" is "<kind>"
    And every golden tokenizer vector of "<goldens>" encodes to its ids through /tokenize

    Examples:
      | kind     | model     | goldens                      |
      | gguf-bpe | reference | testdata/golden/tokenize.json |

    Examples:
      | kind     | model               | goldens                                 |
      | gguf-spm | synthetic-tiny-phi3 | testdata/golden-synth/phi3-tokenize.json |

  @M0-W-1363 @any
  Scenario: All 66 golden tokenizer vectors encode to llama.cpp's ids and decode back
    Given a worker on the reference model
    Then every golden tokenizer vector encodes to its ids through /tokenize
    And every golden tokenizer vector decodes back to its text through /detokenize

  @M0-W-1364 @any
  Scenario Outline: /health reports the tokenizer kind and vocabulary size of the file (<model>)
    Given a worker on the "<model>" model
    Then /health field "vocab_size" equals the model file's vocabulary size
    And /health field "vocab_size" is <vocab>
    And /health field "tokenizer_kind" is "<kind>"

    Examples:
      | model                  | vocab  | kind     |
      | reference              | 49152  | gguf-bpe |
      | synthetic-qwen2.5-0.5b | 151936 | gguf-bpe |
      | synthetic-tiny-qwen2   | 151936 | gguf-bpe |

  @M0-W-1365 @any
  Scenario: Tokenization needs no native code and passes its goldens without a GPU
    Then "cargo tree -p tokenizers -e normal,build" lists no "onig_sys", "onig", "cc", "cmake" or "pkg-config"
    Given a worker on the reference model
    Then every golden tokenizer vector encodes to its ids through /tokenize
