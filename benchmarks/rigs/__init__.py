"""What several benchmarks drive, a module per rig: the fleet simulator (`fleet_sim`) and its runs
(`fleet_runs`), the discrete-event simulation at GPU scale (`event_sim`), `edgekit serve` in a process
of its own (`verifier_process`) or answering from recorded traces (`replayed`), the load generator
(`loadgen`), the peers on one box (`peers`), HAProxy and nginx in front (`proxies`), plain-decoding
streams (`streams`), the stock llama-cpp-python server (`llama_cpp_server`), vLLM's server
(`vllm_server`), hostile messages for the fuzzer (`fuzz_messages`), and emulated links (`linkemu`:
root, network namespaces, tc). Benchmarks and tests import them; they import no benchmark."""
