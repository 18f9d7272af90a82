# Test costs for ctest's schedule. ctest -jN starts tests in descending COST when the build has
# no Testing/Temporary/CTestCostData.txt, which a clean clone (CI) never has; without costs
# it starts them in definition order and the longest integration tests, defined last, end
# the run with one core idle. The figures are seconds measured in the clean-clone CI of
# 2026-11-28 (2 cores, ctest -j2); a test missing here costs 0 and runs after these.
# A rough figure is enough: only the order matters. Refresh it from a run's
# build/Testing/Temporary/CTestCostData.txt when tests change much.
set(TENPLEX_TEST_COSTS
  gpt_train_equivalence=219
  gpt_train_resume=184
  interop_ds=180
  fault_campaign=150
  interop_mcore=122
  interop_dcp2=106
  gpt_train_errors=104
  hetero_uneven=102
  interop_errors=80
  gpt_recompute=78
  slurm=72
  torchrun_etcd=71
  torchrun_elastic=71
  fault_campaign_jobs=71
  torchrun_etcd_netns=68
  torchrun_elastic_netns=66
  hetero_slowdown=65
  interop_dcp=64
  fault_campaign_hostile=58
  elastic_commit=52
  policy_run=51
  membership_netns=48
  membership_rendezvous_kill=47
  membership=47
  interop_hf=47
  interop_transformers=45
  hetero_rebalance=43
  run_presize=41
  fault_2pc=39
  membership_leave=38
  elastic_run_lose_host=38
  ckpt_hostile=37
  elastic_run_cluster=33
  device_run_python=33
  elastic_run_commits=32
  elastic_run=32
  elastic_run_resume_cluster=28
  elastic_run_resume=28
  interop_megatron=27
  elastic_run_warm=27
  membership_quorum=26
  elastic_run_warm_commits=26
  cli_errors=25
  data_python_order=24
  hetero_rebalance_cluster=22
  ops_install=20
  warm_groups=19
  recipe_netns=19
  recipe_install=17
  package=16
  device_bench_cpu=16
  recipe_loopback=15
  policy_cli=15
  python_reference=14
  data_dp_weights=13
  deploy=12
  elastic_api=10
  device_python=9
  store_hardening=8
  hetero_rebalance_warm=45
)
foreach(entry ${TENPLEX_TEST_COSTS})
  string(REPLACE "=" ";" pair ${entry})
  list(GET pair 0 name)
  list(GET pair 1 cost)
  if(TEST ${name})
    set_tests_properties(${name} PROPERTIES COST ${cost})
  endif()
endforeach()
