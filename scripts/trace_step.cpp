// A training step's GPU time kernel by kernel, from CUDA's own record of every kernel it ran (CUPTI
// activity records). Built as a library that CUDA loads into any CUDA program named in
// CUDA_INJECTION64_PATH (scripts/trace_step.sh builds it and runs train_gpt, and llm.c's trainer,
// so), it needs no change to the program traced. At the program's exit it prints, over the steps
// after the first TRACE_SKIP (default 5): each kernel's time a step (its calls' durations summed,
// over the steps), its calls a step and its mean call; the step's span (from one step's first kernel
// to the next one's), the sum of all its kernels (more than the span where two streams overlap) and
// the time in the span when no kernel ran, that time by the length of its gaps, and the kernel pairs
// whose gaps add up to the most of it (a gap's kernels: the one that ended last before it and the
// one that starts it; the idle time also holds any copy or memset, which are not kernels). A step
// begins with the first kernel whose name holds TRACE_MARK (default "encoder_forward": the first
// kernel of a step in both trainers, once a step where a step is one micro-batch). The table goes to
// the file TRACE_OUT, or stderr.
// Durations are as the kernels ran: two kernels that share the GPU both count their whole time.
#include <cupti_activity.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {
struct Call {
    int kernel; // index into names
    uint64_t start, end;
};
std::vector<std::string> names;
std::vector<Call> calls;
std::mutex calls_lock; // CUPTI may hand buffers over from its own thread and from a flush at once

int name_index(const char* name) {
    for (size_t i = 0; i < names.size(); i++)
        if (names[i] == name) return (int)i;
    names.push_back(name);
    return (int)names.size() - 1;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = 8 << 20;
    *buffer = (uint8_t*)aligned_alloc(8, *size);
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    CUpti_Activity* record = nullptr;
    const std::lock_guard<std::mutex> hold(calls_lock);
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const auto* kernel = (const CUpti_ActivityKernel9*)record;
            calls.push_back(Call{name_index(kernel->name), kernel->start, kernel->end});
        }
    free(buffer);
}

// A mangled kernel name as its function's name and template arguments, without the parameters.
std::string readable(const std::string& name) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
    std::string s = status == 0 && demangled ? demangled : name;
    free(demangled);
    if (s.rfind("void ", 0) == 0) s = s.substr(5);
    // the parameter list: the last '(' at template depth 0
    int depth = 0;
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == '<') depth++;
        else if (s[i] == '>') depth--;
        else if (s[i] == '(' && depth == 0 && i > 0) return s.substr(0, i);
    }
    return s;
}

void report() {
    cuptiActivityFlushAll(1);
    const char* mark = getenv("TRACE_MARK") ? getenv("TRACE_MARK") : "encoder_forward";
    const long skip = getenv("TRACE_SKIP") ? atol(getenv("TRACE_SKIP")) : 5;
    FILE* out = getenv("TRACE_OUT") ? fopen(getenv("TRACE_OUT"), "w") : stderr;
    if (!out) out = stderr;
    std::sort(calls.begin(), calls.end(), [](const Call& a, const Call& b) { return a.start < b.start; });
    std::vector<size_t> marks; // the calls that begin a step
    for (size_t i = 0; i < calls.size(); i++)
        if (strstr(names[calls[i].kernel].c_str(), mark)) marks.push_back(i);
    if ((long)marks.size() < skip + 2) {
        fprintf(out, "trace_step: %zu kernels named '%s' (steps begun), fewer than TRACE_SKIP %ld + 2\n", marks.size(),
                mark, skip);
        if (out != stderr) fclose(out);
        return;
    }
    const size_t first = marks[skip], last = marks.back();
    const long steps = (long)marks.size() - 1 - skip;
    std::vector<double> time(names.size(), 0.0);
    std::vector<long> count(names.size(), 0);
    double busy = 0, idle = 0;
    const double gap_limits[] = {2e3, 10e3, 100e3}; // ns: idle time by gap length, up to each and beyond
    double gap_time[4] = {}, gap_count[4] = {};
    std::map<std::pair<int, int>, std::pair<double, long>> gap_pairs; // (before, after) -> (idle, gaps)
    uint64_t covered = calls[first].start; // the latest end of a kernel so far
    int covering = calls[first].kernel;    // the kernel that ended there
    for (size_t i = first; i < last; i++) {
        const Call& c = calls[i];
        time[c.kernel] += (double)(c.end - c.start);
        count[c.kernel]++;
        busy += (double)(c.end - c.start);
        if (c.start > covered) {
            const double gap = (double)(c.start - covered);
            idle += gap;
            int bucket = 0;
            while (bucket < 3 && gap > gap_limits[bucket]) bucket++;
            gap_time[bucket] += gap;
            gap_count[bucket]++;
            auto& pair = gap_pairs[{covering, c.kernel}];
            pair.first += gap;
            pair.second++;
        }
        if (c.end > covered) covered = c.end, covering = c.kernel;
    }
    const double span = (double)(calls[last].start - calls[first].start);
    std::vector<size_t> order;
    for (size_t k = 0; k < names.size(); k++)
        if (count[k]) order.push_back(k);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return time[a] > time[b]; });
    fprintf(out, "%ld steps: %.3f ms a step from first kernel to first kernel, kernels %.3f ms, no kernel %.3f ms\n",
            steps, span / steps / 1e6, busy / steps / 1e6, idle / steps / 1e6);
    fprintf(out, "no kernel, by gap: up to 2 us %.3f ms (%.0f gaps), 2-10 us %.3f (%.0f), 10-100 us %.3f (%.0f), "
                 "longer %.3f (%.0f)\n",
            gap_time[0] / steps / 1e6, gap_count[0] / steps, gap_time[1] / steps / 1e6, gap_count[1] / steps,
            gap_time[2] / steps / 1e6, gap_count[2] / steps, gap_time[3] / steps / 1e6, gap_count[3] / steps);
    std::vector<std::pair<std::pair<int, int>, std::pair<double, long>>> pairs(gap_pairs.begin(), gap_pairs.end());
    std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    fprintf(out, "the kernel pairs with the most time between them:\n%10s %8s %10s  %s\n", "ms/step", "gaps", "us/gap",
            "kernel before -> kernel after");
    for (size_t i = 0; i < pairs.size() && i < 8; i++) {
        const auto& [kernels, g] = pairs[i];
        fprintf(out, "%10.3f %8.1f %10.2f  %.90s -> %.90s\n", g.first / steps / 1e6, (double)g.second / steps,
                g.first / g.second / 1e3, readable(names[kernels.first]).c_str(),
                readable(names[kernels.second]).c_str());
    }
    fprintf(out, "%10s %8s %10s  %s\n", "ms/step", "calls", "us/call", "kernel");
    for (size_t k : order)
        fprintf(out, "%10.3f %8.1f %10.2f  %.160s\n", time[k] / steps / 1e6, (double)count[k] / steps,
                time[k] / count[k] / 1e3, readable(names[k]).c_str());
    if (out != stderr) fclose(out);
}
} // namespace

// CUDA calls this when it loads the library (CUDA_INJECTION64_PATH), before the program's first CUDA call.
extern "C" int InitializeInjection(void) {
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
        fprintf(stderr, "trace_step: CUPTI refused the kernel records; no trace\n");
        return 0;
    }
    atexit(report);
    return 1;
}
