// train_step.hpp — the forward/backward training loop of benchmarks/train_threads.c for every
// allocator: per step a new sequence length; forward on the calling thread allocates each
// layer's activations, backward frees them in reverse and allocates the gradients, the optimizer
// updates every weight through a temporary and frees the gradients; weights and optimizer states
// stay live. With two threads the backward pass runs on its own thread, which takes its turn
// between forward and optimizer (a hand-off, as PyTorch's autograd engine does): the same
// requests in the same order on the default stream of device 0.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>

#include "loops.hpp"

namespace pb {
template <class Alloc, class Free>
class TrainLoop {
 public:
  static constexpr int kLayers = 32;
  static constexpr std::size_t kHidden = 768, kHeads = 16, kMaxSeq = 1024;
  static constexpr std::size_t kWeight = kHidden * kHidden * 2 * 2;  // 2 kHidden^2 in bf16

  TrainLoop(Alloc alloc, Free release) : alloc_(alloc), free_(release) {}

  // `steps` steps with the backward pass on a second thread when `threads` is 2; `bind` makes
  // device 0 current on that thread. Returns the number of allocations made.
  template <class Bind>
  long run(int threads, int steps, unsigned seed, Bind bind) {
    rng_ = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (auto& w : weights_)
      for (auto& p : w) p = get(kWeight);
    std::thread backward_thread;
    if (threads == 2)
      backward_thread = std::thread([&] {
        bind(0);
        for (;;) {
          std::unique_lock lock(mu_);
          cv_.wait(lock, [&] { return turn_ != 0; });
          if (turn_ == 2) return;
          lock.unlock();
          backward();
          lock.lock();
          turn_ = 0;
          cv_.notify_all();
        }
      });
    for (int step = 0; step < steps; ++step) {
      rng_ ^= rng_ << 13;
      rng_ ^= rng_ >> 7;
      rng_ ^= rng_ << 17;
      forward(128 + static_cast<std::size_t>(rng_ % (kMaxSeq - 128)) / 32 * 32);
      if (threads == 2)
        hand_over(1);
      else
        backward();
      optimizer();
    }
    if (threads == 2) {
      hand_over(2);
      backward_thread.join();
    }
    for (int l = 0; l < kLayers; ++l)
      for (int k = 0; k < 2; ++k) {
        put(weights_[l][k], kWeight);
        for (int m = 0; m < 2; ++m) put(adam_[l][k][m], kWeight * 2);
      }
    return allocations_;
  }

 private:
  void* get(std::size_t n) {
    ++allocations_;
    void* p = alloc_(n, Ctx{nullptr, 0});
    escape(p);
    return p;
  }
  void put(void*& p, std::size_t n) {
    free_(p, n, Ctx{nullptr, 0});
    p = nullptr;
  }
  void forward(std::size_t seq) {
    act_[0] = seq * kHidden * 2;                  // the layer's input
    act_[1] = seq * kHidden * 4 * 2;              // the MLP's intermediate
    act_[2] = kHeads * seq * seq / 8 * 2;         // attention scores (blocked)
    act_[3] = seq * 4 + 512 * (1 + seq % 7);      // norms and small statistics
    for (int l = 0; l < kLayers; ++l) {
      void* scratch = get(act_[1] / 2);
      for (int k = 0; k < 4; ++k) acts_[l][k] = get(act_[k]);
      put(scratch, act_[1] / 2);
    }
  }
  void backward() {
    void* grad_out = get(act_[0]);
    for (int l = kLayers - 1; l >= 0; --l) {
      void* grad_in = get(act_[0]);
      void* tmp = get(act_[1]);
      for (int k = 0; k < 2; ++k)
        if (grads_[l][k] == nullptr) grads_[l][k] = get(kWeight);
      put(tmp, act_[1]);
      for (int k = 3; k >= 0; --k) put(acts_[l][k], act_[k]);
      put(grad_out, act_[0]);
      grad_out = grad_in;
    }
    put(grad_out, act_[0]);
  }
  void optimizer() {
    for (int l = 0; l < kLayers; ++l)
      for (int k = 0; k < 2; ++k) {
        void* tmp = get(kWeight * 2);  // the update in fp32
        for (int m = 0; m < 2; ++m)
          if (adam_[l][k][m] == nullptr) adam_[l][k][m] = get(kWeight * 2);
        put(tmp, kWeight * 2);
        put(grads_[l][k], kWeight);
      }
  }
  void hand_over(int to) {
    std::unique_lock lock(mu_);
    turn_ = to;
    cv_.notify_all();
    cv_.wait(lock, [&] { return turn_ != 1; });
  }

  Alloc alloc_;
  Free free_;
  std::uint64_t rng_ = 0;
  long allocations_ = 0;
  void* weights_[kLayers][2] = {};
  void* adam_[kLayers][2][2] = {};
  void* grads_[kLayers][2] = {};
  void* acts_[kLayers][4] = {};
  std::size_t act_[4] = {};
  std::mutex mu_;
  std::condition_variable cv_;
  int turn_ = 0;  // 0: the main thread's, 1: the backward thread's, 2: stop
};
}  // namespace pb
