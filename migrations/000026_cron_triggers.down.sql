DROP FUNCTION installation_cron_count(text, uuid);
DROP TABLE cron_ticks;
DROP TYPE cron_tick_outcome;
DROP TRIGGER workers_sync_crons ON workers;
DROP FUNCTION sync_worker_crons();
DROP TABLE worker_crons;
