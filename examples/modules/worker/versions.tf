terraform {
  required_version = ">= 1.11"
  required_providers {
    takoform = {
      source = "takoform/takoform"
    }
  }
}
