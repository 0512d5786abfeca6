// Roles from a cluster launcher's environment and --layout (libps/net/launch_layout).
#include <doctest/doctest.h>

#include <map>

#include "libps/keys/keys.hpp"
#include "libps/net/launch_layout.hpp"

using namespace ps;

namespace {

env_lookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace

TEST_CASE("layout: servers and workers in either order; anything else refused by name") {
  auto l = parse_layout("servers:4,workers:8");
  CHECK(l.servers == 4);
  CHECK(l.workers == 8);
  CHECK(l.ranks() == 13);
  CHECK(parse_layout("workers:2,servers:1").text() == "servers:1,workers:2");
  CHECK_THROWS_WITH_AS(parse_layout("servers:2"), doctest::Contains("needs both servers:N and workers:N"), bad_request);
  CHECK_THROWS_WITH_AS(parse_layout("servers:2,workers:0"), doctest::Contains("\"workers:0\""), bad_request);
  CHECK_THROWS_WITH_AS(parse_layout("servers:2,servers:3,workers:1"), doctest::Contains("each once"), bad_request);
  CHECK_THROWS_WITH_AS(parse_layout("shards:2,workers:1"), doctest::Contains("\"shards:2\""), bad_request);
  CHECK_THROWS_AS(parse_layout(""), bad_request);
}

TEST_CASE("layout: Slurm's host lists expand with their zero padding") {
  CHECK(expand_host_list("node7") == std::vector<std::string>{"node7"});
  CHECK(expand_host_list("n[01-03,7],gpu5") == std::vector<std::string>{"n01", "n02", "n03", "n7", "gpu5"});
  CHECK(expand_host_list("a,b[9-10]") == std::vector<std::string>{"a", "b9", "b10"});
  CHECK_THROWS_WITH_AS(expand_host_list("n[1-3"), doctest::Contains("without its ']'"), bad_request);
  CHECK_THROWS_WITH_AS(expand_host_list("n[3-1]"), doctest::Contains("\"3-1\""), bad_request);
  CHECK_THROWS_WITH_AS(expand_host_list("n[1-2]x"), doctest::Contains("goes on after"), bad_request);
  CHECK_THROWS_AS(expand_host_list("a,,b"), bad_request);
}

TEST_CASE("layout: the rank comes from Open MPI, PMI or Slurm, MPI's first") {
  CHECK_FALSE(launcher_rank_from(env_of({{"HOME", "/root"}})));
  auto slurm = launcher_rank_from(env_of({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "5"}, {"SLURM_JOB_ID", "42"},
                                          {"SLURM_JOB_NODELIST", "c[1-2]"}}));
  REQUIRE(slurm);
  CHECK(slurm->launcher == "slurm");
  CHECK(slurm->rank == 3);
  CHECK(slurm->size == 5);
  CHECK(slurm->job_id == "42");
  CHECK(slurm->nodes == std::vector<std::string>{"c1", "c2"});
  // A step's own task count wins over the allocation's.
  auto step = launcher_rank_from(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_STEP_NUM_TASKS", "5"}}));
  CHECK(step->size == 5);
  // mpirun inside an sbatch script: its ranks inherit the batch step's SLURM_PROCID=0.
  auto mpi = launcher_rank_from(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"OMPI_COMM_WORLD_RANK", "2"},
                                        {"OMPI_COMM_WORLD_SIZE", "5"}, {"OMPI_MCA_ess_base_jobid", "77"}}));
  CHECK(mpi->launcher == "openmpi");
  CHECK(mpi->rank == 2);
  CHECK(mpi->job_id == "77");
  CHECK(mpi->nodes.empty());
  CHECK(launcher_rank_from(env_of({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}))->launcher == "pmi");
  CHECK_THROWS_WITH_AS(launcher_rank_from(env_of({{"PMI_RANK", "1"}})), doctest::Contains("not PMI_SIZE"), bad_request);
  CHECK_THROWS_WITH_AS(launcher_rank_from(env_of({{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}})),
                       doctest::Contains("PMI_RANK=\"x\" is not a count"), bad_request);
  CHECK_THROWS_WITH_AS(launcher_rank_from(env_of({{"PMI_RANK", "2"}, {"PMI_SIZE", "2"}})),
                       doctest::Contains("not below PMI_SIZE=2"), bad_request);
}

TEST_CASE("layout: rank 0 coordinates, then the servers, then the workers") {
  auto layout = parse_layout("servers:2,workers:2");
  launcher_rank r{"slurm", "SLURM_PROCID", "SLURM_NTASKS", 0, 5, "9", {"h1", "h2"}};
  std::vector<std::pair<std::string, std::size_t>> seen;
  for (std::size_t i = 0; i < 5; ++i) {
    r.rank = i;
    auto plan = plan_layout(layout, r, "", 0, false);
    seen.emplace_back(plan.role, plan.index);
    CHECK(plan.coordinator == "h1:7070");  // Slurm: the first host, the default port
    CHECK(plan.listen_port == (i == 0 ? 7070 : 0));
  }
  CHECK(seen == std::vector<std::pair<std::string, std::size_t>>{
                    {"coordinator", 0}, {"server", 0}, {"server", 1}, {"worker", 0}, {"worker", 1}});
  r.rank = 0;
  CHECK(plan_layout(layout, r, "", 7200, false).coordinator == "h1:7200");
  CHECK(plan_layout(layout, r, "gw:7300", 0, false).listen_port == 7300);
  CHECK_THROWS_WITH_AS(plan_layout(layout, r, "gw:7300", 7200, false), doctest::Contains("disagree"), bad_request);
}

TEST_CASE("layout: MPI names no host, so a coordinator flag or a rendezvous file must") {
  auto layout = parse_layout("servers:1,workers:1");
  launcher_rank r{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", 1, 3, "5", {}};
  CHECK_THROWS_WITH_AS(plan_layout(layout, r, "", 0, false), doctest::Contains("--rendezvous=FILE"), bad_request);
  CHECK(plan_layout(layout, r, "", 0, true).coordinator.empty());
  r.rank = 0;
  CHECK(plan_layout(layout, r, "", 0, true).listen_port == 0);  // any free port; the file tells it
  CHECK(plan_layout(layout, r, "", 0, true).role == "coordinator");
}

TEST_CASE("layout: ranks that do not fit are named with both counts") {
  launcher_rank r{"slurm", "SLURM_PROCID", "SLURM_NTASKS", 0, 4, "", {}};
  auto layout = parse_layout("servers:2,workers:2");
  CHECK(layout_mismatch(layout, r) ==
        "--layout=servers:2,workers:2 needs 5 ranks (1 coordinator, 2 servers, 2 workers), but slurm started 4 "
        "(SLURM_NTASKS=4)");
  r.size = 5;
  CHECK(layout_mismatch(layout, r).empty());
}

TEST_CASE("layout: a rendezvous line is read back only by its own job") {
  auto line = rendezvous_line("77", "host-a:40000");
  CHECK(rendezvous_address(line, "77") == std::optional<std::string>{"host-a:40000"});
  CHECK_FALSE(rendezvous_address(line, "78"));  // an earlier job's file
  CHECK(rendezvous_address(line, "") == std::optional<std::string>{"host-a:40000"});
  CHECK_FALSE(rendezvous_address(line.substr(0, line.size() / 2), "77"));  // torn
  CHECK_FALSE(rendezvous_address("{\"job\":\"77\"}", "77"));
}
