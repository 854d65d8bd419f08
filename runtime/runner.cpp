#include "runtime/runner.h"

#include "runtime/cpu_backend.h"
#include "runtime/error.h"
#include "runtime/membw.h"
#ifdef TANDEM_HAVE_CUDA
#include "runtime/models/qwen3_5_moe_gpu.h"
#endif

namespace tandem {

namespace {

class HostRunner final : public Runner {
 public:
  HostRunner(const Qwen35Moe& m, std::unique_ptr<CpuBackend> backend) : model_(m), backend_(std::move(backend)) { reset(); }
  void reset() override {
    state_ = model_.new_state();
    state_.backend = backend_.get();
  }
  void forward(std::span<const int32_t> ids, float* logits, Qwen35Moe::LogitRows rows) override {
    model_.forward(state_, ids, logits, {}, rows);
  }
  std::string describe() const override {
    return backend_ ? "cpu: " + backend_->describe() : "ref: exact fp32 reference";
  }
  double weight_bandwidth(std::string* what) override {
    if (what) *what = "CPU read bandwidth";
    return measure_read_bandwidth().bytes_per_s;
  }

 private:
  const Qwen35Moe& model_;
  std::unique_ptr<CpuBackend> backend_;
  Qwen35State state_;
};

#ifdef TANDEM_HAVE_CUDA
class GpuRunner final : public Runner {
 public:
  explicit GpuRunner(std::unique_ptr<Qwen35MoeGpu> g) : gpu_(std::move(g)) {}
  void reset() override { gpu_->reset(); }
  void forward(std::span<const int32_t> ids, float* logits, Qwen35Moe::LogitRows rows) override {
    gpu_->forward(ids, logits, rows);
  }
  std::string describe() const override { return "gpu: " + gpu_->memory().describe(); }
  uint64_t peak_device_bytes() const override { return gpu_->memory().total(); }
  double weight_bandwidth(std::string* what) override {
    if (what) *what = "GPU copy bandwidth";
    return gpu_->copy_bandwidth();
  }

 private:
  std::unique_ptr<Qwen35MoeGpu> gpu_;
};
#endif

}  // namespace

std::unique_ptr<Runner> make_runner(const Qwen35Moe& model, const RunnerOptions& o) {
  if (o.device == "ref") return std::make_unique<HostRunner>(model, nullptr);
  if (o.device == "cpu") {
    CpuBackendOptions co;
    co.threads = o.threads;
    if (o.cpu_expert_format == "int8") co.dense_expert_format = cpu::WeightFormat::Int8;
    else if (o.cpu_expert_format == "bf16") co.dense_expert_format = cpu::WeightFormat::BF16;
    else fail("--cpu-expert-format must be int8 or bf16 (got '", o.cpu_expert_format, "')");
    return std::make_unique<HostRunner>(model, std::make_unique<CpuBackend>(model, co));
  }
  if (o.device == "gpu") {
#ifdef TANDEM_HAVE_CUDA
    return std::make_unique<GpuRunner>(Qwen35MoeGpu::create(model, {o.gpu_mem, o.context}));
#else
    fail("--device gpu: no CUDA device (this build has no CUDA support)");
#endif
  }
  if (o.device == "hybrid") fail("--device hybrid is not available in this version; use ref, cpu or gpu");
  fail("--device must be one of ref, cpu, gpu, hybrid (got '", o.device, "')");
}

}  // namespace tandem
