import {
  to = takoform_worker.api
  id = "prod/api"
}
