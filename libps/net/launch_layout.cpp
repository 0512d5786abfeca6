#include "libps/net/launch_layout.hpp"

#include <nlohmann/json.hpp>

#include "libps/keys/keys.hpp"
#include "libps/net/endpoint.hpp"
#include "libps/observe/text.hpp"

namespace ps {

namespace {

// The count a launcher variable holds; throws naming the variable.
std::size_t count_var(const env_lookup& env, const std::string& name) {
  auto text = env(name).value_or("");
  auto n = parse_count(text);
  if (!n) throw bad_request("the launcher's " + name + "=\"" + text + "\" is not a count");
  return *n;
}

std::optional<launcher_rank> read_rank(const env_lookup& env, const std::string& launcher, const std::string& rank_var,
                                       const std::vector<std::string>& size_vars) {
  if (!env(rank_var)) return std::nullopt;
  launcher_rank r;
  r.launcher = launcher;
  r.rank_var = rank_var;
  for (const auto& v : size_vars)
    if (env(v)) {
      r.size_var = v;
      break;
    }
  if (r.size_var.empty()) throw bad_request("the launcher set " + rank_var + " but not " + size_vars.front());
  r.rank = count_var(env, rank_var);
  r.size = count_var(env, r.size_var);
  if (r.rank >= r.size)
    throw bad_request("the launcher's " + rank_var + "=" + std::to_string(r.rank) + " is not below " + r.size_var + "=" +
                      std::to_string(r.size));
  return r;
}

// One bracket's ranges, "01-03,7", each number keeping the width it was written with.
void expand_ranges(const std::string& prefix, const std::string& ranges, const std::string& list,
                   std::vector<std::string>& hosts) {
  for (const auto& range : split(ranges, ',')) {
    auto dash = range.find('-');
    auto first_text = range.substr(0, dash);
    auto last_text = dash == std::string::npos ? first_text : range.substr(dash + 1);
    auto first = parse_count(first_text), last = parse_count(last_text);
    if (!first || !last || *last < *first || *last - *first > 100000)
      throw bad_request("host list \"" + list + "\": \"" + range + "\" is not a range of numbers");
    for (auto n = *first; n <= *last; ++n) {
      auto digits = std::to_string(n);
      if (digits.size() < first_text.size()) digits.insert(0, first_text.size() - digits.size(), '0');
      hosts.push_back(prefix + digits);
    }
  }
}

}  // namespace

std::string job_layout::text() const {
  return "servers:" + std::to_string(servers) + ",workers:" + std::to_string(workers);
}

job_layout parse_layout(const std::string& text) {
  job_layout layout;
  bool seen_servers = false, seen_workers = false;
  for (const auto& part : split(text, ',')) {
    auto colon = part.find(':');
    auto name = part.substr(0, colon);
    auto n = colon == std::string::npos ? std::nullopt : parse_count(part.substr(colon + 1));
    bool& seen = name == "servers" ? seen_servers : seen_workers;
    if ((name != "servers" && name != "workers") || !n || *n < 1 || *n > 1024 || seen)
      throw bad_request("--layout=" + text + ": \"" + part + "\" is not servers:N or workers:N (N in [1, 1024], each once)");
    seen = true;
    (name == "servers" ? layout.servers : layout.workers) = *n;
  }
  if (!seen_servers || !seen_workers)
    throw bad_request("--layout=" + text + " needs both servers:N and workers:N (rank 0 coordinates, then the servers, "
                      "then the workers)");
  return layout;
}

std::optional<launcher_rank> launcher_rank_from(const env_lookup& env) {
  if (auto r = read_rank(env, "openmpi", "OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_SIZE"})) {
    r->job_id = env("OMPI_MCA_ess_base_jobid").value_or(env("PMIX_NAMESPACE").value_or(""));
    return r;
  }
  if (auto r = read_rank(env, "pmi", "PMI_RANK", {"PMI_SIZE"})) return r;
  if (auto r = read_rank(env, "slurm", "SLURM_PROCID", {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"})) {
    r->job_id = env("SLURM_JOB_ID").value_or("");
    auto list = env("SLURM_STEP_NODELIST").value_or(env("SLURM_JOB_NODELIST").value_or(""));
    if (!list.empty()) r->nodes = expand_host_list(list);
    return r;
  }
  return std::nullopt;
}

std::vector<std::string> expand_host_list(const std::string& text) {
  std::vector<std::string> hosts;
  std::size_t at = 0;
  while (at < text.size()) {
    auto open = text.find('[', at), comma = text.find(',', at);
    if (comma < open) {  // a plain name before the next bracket
      hosts.push_back(text.substr(at, comma - at));
      at = comma + 1;
      continue;
    }
    if (open == std::string::npos) {
      hosts.push_back(text.substr(at));
      break;
    }
    auto close = text.find(']', open);
    if (close == std::string::npos) throw bad_request("host list \"" + text + "\": a '[' without its ']'");
    expand_ranges(text.substr(at, open - at), text.substr(open + 1, close - open - 1), text, hosts);
    at = close + 1;
    if (at < text.size() && text[at] != ',')
      throw bad_request("host list \"" + text + "\": a name goes on after its brackets");
    ++at;
  }
  for (const auto& h : hosts)
    if (h.empty()) throw bad_request("host list \"" + text + "\" holds an empty name");
  return hosts;
}

std::string layout_mismatch(const job_layout& layout, const launcher_rank& rank) {
  if (rank.size == layout.ranks()) return "";
  return "--layout=" + layout.text() + " needs " + std::to_string(layout.ranks()) + " ranks (1 coordinator, " +
         std::to_string(layout.servers) + " servers, " + std::to_string(layout.workers) + " workers), but " +
         rank.launcher + " started " + std::to_string(rank.size) + " (" + rank.size_var + "=" +
         std::to_string(rank.size) + ")";
}

layout_plan plan_layout(const job_layout& layout, const launcher_rank& rank, const std::string& coordinator_flag,
                        std::uint16_t port_flag, bool has_rendezvous) {
  layout_plan plan;
  if (rank.rank == 0) plan.role = "coordinator";
  else if (rank.rank <= layout.servers) plan.role = "server", plan.index = rank.rank - 1;
  else plan.role = "worker", plan.index = rank.rank - 1 - layout.servers;
  std::uint16_t port = port_flag;
  if (!coordinator_flag.empty()) {
    auto [host, given_port] = parse_host_port(coordinator_flag);
    if (port_flag != 0 && port_flag != given_port)
      throw bad_request("--port=" + std::to_string(port_flag) + " and --coordinator=" + coordinator_flag +
                        " disagree: under --layout, --port is the coordinator's port");
    plan.coordinator = coordinator_flag;
    port = given_port;
  } else if (!has_rendezvous) {
    if (rank.nodes.empty())
      throw bad_request(rank.launcher + " (" + rank.rank_var + ") names no host for rank 0, the coordinator: give "
                        "--coordinator=HOST:PORT (rank 0's host) or --rendezvous=FILE on a directory every rank sees");
    if (port == 0) port = default_layout_port;
    plan.coordinator = rank.nodes.front() + ":" + std::to_string(port);
  }
  if (rank.rank == 0) plan.listen_port = port;
  return plan;
}

std::string rendezvous_line(const std::string& job_id, const std::string& coordinator) {
  return nlohmann::json{{"job", job_id}, {"coordinator", coordinator}}.dump();
}

std::optional<std::string> rendezvous_address(const std::string& line, const std::string& job_id) {
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("coordinator") || !j["coordinator"].is_string() || !j.contains("job") ||
      !j["job"].is_string())
    return std::nullopt;
  auto job = j["job"].get<std::string>();
  if (!job_id.empty() && !job.empty() && job != job_id) return std::nullopt;
  return j["coordinator"].get<std::string>();
}

}  // namespace ps
