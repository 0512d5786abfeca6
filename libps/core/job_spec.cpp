#include "libps/core/job_spec.hpp"

#include <cstdio>

#include <algorithm>

namespace ps {

namespace {

struct fnv1a {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  void bytes(const void* p, std::size_t n) {
    auto* c = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 0x100000001b3ULL;
  }
  void u64(std::uint64_t v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {  // length first: "ab"+"c" differs from "a"+"bc"
    u64(s.size());
    bytes(s.data(), s.size());
  }
};

}  // namespace

void job_spec::set(const std::string& name, std::string value) {
  auto it = std::lower_bound(settings_.begin(), settings_.end(), name,
                             [](const job_setting& s, const std::string& n) { return s.name < n; });
  if (it != settings_.end() && it->name == name)
    it->value = std::move(value);
  else
    settings_.insert(it, {name, std::move(value)});
}

std::optional<std::string> job_spec::get(const std::string& name) const {
  for (const auto& s : settings_)
    if (s.name == name) return s.value;
  return std::nullopt;
}

void job_spec::add_tensor(tensor_spec t) {
  if (t.keys.empty()) throw bad_request("tensor " + t.name + ": no keys");
  for (const auto& other : tensors_)
    if (t.keys.begin < other.keys.end && other.keys.begin < t.keys.end)
      throw bad_request("tensor " + t.name + " " + to_string(t.keys) + " overlaps tensor " + other.name + " " +
                        to_string(other.keys));
  std::uint64_t product = 1;
  for (auto d : t.shape) product *= d;
  if (!t.shape.empty() && product != t.keys.size())
    throw bad_request("tensor " + t.name + ": shape holds " + std::to_string(product) + " values, keys " +
                      std::to_string(t.keys.size()));
  tensors_.push_back(std::move(t));
}

std::uint64_t job_spec::num_keys() const {
  std::uint64_t n = 0;
  for (const auto& t : tensors_) n += t.keys.size();
  return n;
}

std::uint64_t job_spec::fingerprint() const {
  fnv1a f;
  f.u64(version);
  f.u64(settings_.size());
  for (const auto& s : settings_) {
    f.str(s.name);
    f.str(s.value);
  }
  f.u64(tensors_.size());
  for (const auto& t : tensors_) {
    f.str(t.name);
    f.u64(t.keys.begin);
    f.u64(t.keys.end);
    f.u64(t.shape.size());
    for (auto d : t.shape) f.u64(d);
  }
  return f.h;
}

std::vector<setting_difference> job_spec::differences(const std::vector<job_setting>& given) const {
  std::vector<setting_difference> out;
  for (const auto& g : given) {
    auto have = get(g.name);
    if (!have || *have != g.value) out.push_back({g.name, have.value_or("(not set)"), g.value});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

job_spec job_spec::from_parts(std::uint32_t version, std::vector<job_setting> settings,
                              std::vector<tensor_spec> tensors) {
  job_spec spec;
  spec.version = version;
  for (auto& s : settings) {
    if (s.name.empty()) throw bad_request("job spec: a setting without a name");
    if (spec.get(s.name)) throw bad_request("job spec: setting " + s.name + " appears twice");
    spec.set(s.name, std::move(s.value));
  }
  for (auto& t : tensors) spec.add_tensor(std::move(t));
  return spec;
}

std::vector<key_range> dense_ranges(const job_spec& spec) {
  std::vector<key_range> out;
  for (const auto& t : spec.tensors()) out.push_back(t.keys);
  std::sort(out.begin(), out.end(), [](const key_range& a, const key_range& b) { return a.begin < b.begin; });
  return out;
}

std::string describe_differences(const std::vector<setting_difference>& diffs) {
  std::string out;
  for (const auto& d : diffs) {
    if (!out.empty()) out += ", ";
    out += "--" + d.name + "=" + d.given_value + " (the job has " + d.job_value + ")";
  }
  return out;
}

std::string version_mismatch(std::uint32_t member_version, std::uint32_t job_version) {
  if (member_version == job_version) return {};
  return "protocol version " + std::to_string(member_version) + " cannot join a job of protocol version " +
         std::to_string(job_version) + " (members meet only at the same version: run the coordinator's build, " +
         "version " + std::to_string(job_version) + ")";
}

std::string fingerprint_hex(const job_spec& spec) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(spec.fingerprint()));
  return buf;
}

namespace {

std::string tensor_text(const tensor_spec& t) { return t.name + " " + to_string(t.keys); }

// The declared tensors beside a key outside them: the last one before it and the first after.
std::string nearest_tensors(key_type key, const std::vector<tensor_spec>& sorted) {
  auto after = std::find_if(sorted.begin(), sorted.end(), [&](const tensor_spec& t) { return t.keys.begin > key; });
  std::string out;
  if (after != sorted.begin()) out = tensor_text(*std::prev(after));
  if (after != sorted.end()) out += (out.empty() ? "" : ", ") + tensor_text(*after);
  return out;
}

}  // namespace

std::string keys_outside(const std::vector<key_range>& keys, const std::vector<tensor_spec>& tensors) {
  if (tensors.empty()) return "";
  const auto& sorted = tensors;
  auto next = sorted.begin();  // keys are ascending: the walk goes on where it stopped
  for (auto r : keys) {
    while (!r.empty()) {  // walk r across the tensors: the first key not covered is the error
      next = std::find_if(next, sorted.end(), [&](const tensor_spec& t) { return t.keys.end > r.begin; });
      if (next == sorted.end() || next->keys.begin > r.begin) {
        key_range out{r.begin, next == sorted.end() ? r.end : std::min(r.end, next->keys.begin)};
        return "keys " + to_string(out) + " are outside every declared tensor (nearest: " +
               nearest_tensors(r.begin, sorted) + ")";
      }
      r.begin = std::min(r.end, next->keys.end);
    }
  }
  return "";
}

}  // namespace ps
